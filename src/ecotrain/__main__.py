from ecotrain.cli import main

code = main()  # main() itself ignores stop signals once the command is done (interpreter teardown)
# A Ctrl-C / SIGTERM that main() caught may have passed through a string exec (dataclasses and
# namedtuple build their methods that way during an import). CPython then marks the interrupt
# "unhandled", and under `python -m` Py_RunMain kills the process with SIGINT (exit -2) instead of
# exiting with `code`. Every string exec clears that mark at its start, so one finished one does.
exec("None")  # noqa: S102
raise SystemExit(code)
