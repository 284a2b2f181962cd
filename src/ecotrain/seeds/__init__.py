"""Floor 3, a wing (docs/architecture.md, "Floors: who may import whom"): seed groups. `sweep` trains a
recipe on several seeds (`fit --seeds`, a group file naming the runs); `decide` adds seeds until the
comparison's verdict decides (`--until-decided`).

Nothing is imported here: `ecotrain compare` and `ecotrain ledger` read seed groups without torch or
pydantic.
"""
