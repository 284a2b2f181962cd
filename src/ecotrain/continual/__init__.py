"""Continual updates: a model updated again and again without forgetting (docs/continual.md).

The protections are methods (methods/replay.py, ewc.py, lwf.py, adapters.py); this package holds
the scenarios they are measured on (scenario.py) and the versions, gate, drift and review queue of
`ecotrain update`.
"""
