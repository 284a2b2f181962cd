"""Floor 0, the base (docs/architecture.md, "Floors: who may import whom"): errors (each with its exit
code), the `ecotrain` logger, the version, byte sizes (units), the lock file, non-UTF-8 file names
(fsnames), start-up without the cyclic collector, the run folder's file names (runfiles), reads that cannot hang (safefile). It imports
nothing of ecotrain's above it.

Nothing is imported here: `import ecotrain` and `ecotrain --help` import no torch.
"""
