"""The lab: one experiment config, the demonstrations, one report (`ctxlab workshop`).

`demonstration` (what a demonstration declares), one `demo_*` module per demonstration,
`registry` (the registered demonstrations and the config schema they make), `config` (the
shared tables of the TOML contract, pydantic), `verdicts` (predictions against observations),
`useful_context`, `context_numbers`, `checklist`, `document` and the report writers, and
`runner` (one run end to end). Importing the package loads no torch.
"""
