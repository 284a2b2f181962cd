"""`ecotrain report`: one self-contained report.html from run folders (build.py; docs/report.md).

Imports nothing at first: `ecotrain --help` imports this package for its parser (commands.py), and must
not pay for the page's builders; `from ecotrain.report import build_report` still reaches them."""

_BUILD = ("build_report", "diagnose_run", "DEFAULT_REGIONS")


def __getattr__(name: str):
    if name in _BUILD:
        from ecotrain.report import build

        return getattr(build, name)
    raise AttributeError(name)
