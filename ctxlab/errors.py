"""The one exception type for user mistakes: bad configs, traces, model files, requests.

The CLI prints its message (one sentence) and exits with code 2; no traceback. Raise it
for anything a user can fix; let real bugs raise whatever they raise.
"""


class CtxlabError(ValueError):
    """A user-facing error whose message is one clear sentence."""
