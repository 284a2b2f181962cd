"""Floor 4, the assembly (docs/architecture.md, "Floors: who may import whom"): each command's work as
a function: `entry` (fit_recipe, resume_run), `trainer` (fit), `assemble`, `finish`, `wings` (where
the wings register their callbacks) and `lrfind`.

Nothing is imported here: `import ecotrain` imports no torch (`ecotrain.fit` comes from
`assembly.trainer` on first use).
"""
