"""The lab: one experiment config, the demonstrations, one report (`ctxlab workshop`).

`config` (the TOML contract, pydantic), `catalog` (demonstrations and their metrics),
`verdicts` (predictions against observations), one `demo_*` module per demonstration,
`useful_context`, `context_numbers`, `checklist`, `document` and the report writers, and
`runner` (one run end to end). Importing the package loads no torch.
"""
