"""Floor 1, the core's flat modules (docs/architecture.md, "Floors: who may import whom"): the batch,
the task, the loop, the training state, the objective, precision, the step plan, the optimizer and
its schedule, metrics, the run folder, safe loading and tensor files, distributed, the device,
seeding, threads, the environment, the stall watch, preemption, resume, statistics, the data
formats, the input contract, the FLOP counter and the other one-job modules below the methods. The
core's packages (checkpoint/, data/, callbacks/, config/, models/) keep their own paths beside it:
users and recipes name them (`ecotrain.config`, `ecotrain.callbacks`).

Nothing is imported here: `ecotrain --help` imports no torch, and the light readers (data_formats,
accounting's ledger and compare) import neither torch nor pydantic.
"""
