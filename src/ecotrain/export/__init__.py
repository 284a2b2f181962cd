"""Shipping a trained run: `ecotrain export` (a `torch.export` program or ONNX, checked against the eager
model on the run's test split), `ecotrain card` (a Hugging Face model card whose `co2_eq_emissions`
comes from the ledger) and `ecotrain predict MODEL.pt2|MODEL.onnx` (no model class needed). docs/export.md.

What each module owns: `shipped` which run a folder or seed group ships (chosen on validation only);
`program` tracing the model with its input spec and saving it; `onnxfile` everything that needs the
onnx extra; `parity` running the exported file against eager; `card` the model card (no torch);
`predict` predictions from an exported file; `lm` a language model's parity windows and tokenizer;
`generate` a language model's `predict` (prompts continued, from a run or its export); `cli_export` the
`export` command putting them together.

Nothing is imported here: `ecotrain card` must start without torch.
"""
