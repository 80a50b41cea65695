"""The one client-side layer under every command that talks to an OpenAI-compatible server
(`probe`, `bench serve`, `eval --backend openai`, `memory`/`rag` over a server, `workshop
--server`): one rule for a base URL and no credentials in what is printed or written
(`url`), a total deadline per request (`deadline`), and answers read through typed
accessors that refuse a wrong shape or an impossible value in one sentence (`fields`,
`sse`). A peer is hostile or broken until its answer has been read through here.
"""
