"""The arguments of continual updates' commands: update, versions, promote, rollback, canary, review-queue
(docs/updates.md). Argparse only, no torch: imported to parse its command, before torch
(ecotrain/cli/commands.py lists the commands); the bodies are in cli/continual.py, imported when
one of the commands runs."""

from __future__ import annotations

REGISTRY_HELP = "the registry: a folder (default ./registry), or mlflow:TRACKING_URI[#MODEL] (MLflow's Model Registry)"


def update(u) -> None:
    u.add_argument("base", metavar="BASE_VERSION", help="a version name (v0002), `current`, or a finished run folder "
                   "(registered first when the registry is empty)")
    u.add_argument("data", metavar="NEW_DATA", help=".npz: x, y [, x_test, y_test, cohort, cohort_test]; a language "
                   "model's: tokens:DIR, tokens:FILE.bin, shards:PATTERN or text")
    u.add_argument("overrides", nargs="*", help="dotted overrides of the base's config, e.g. "
                   "'methods=[{name: replay}]' loop.max_steps=200")
    u.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    u.add_argument("--recipe", help="train with this recipe instead of the base version's config")
    u.add_argument("--tolerance", type=float, default=0.02, help="largest allowed drop of the holdout's average "
                   "accuracy (default 0.02); a language model's: largest relative rise of its perplexity (0.02: 2%%)")
    u.add_argument("--min-gain", type=float, default=0.0, help="the recent slice must improve by more (default 0; "
                   "a language model's perplexity: relative fall)")
    u.add_argument("--cap", type=float, help="kappa: largest drop allowed on any one holdout slice on its own "
                   "(default: none, the average's --tolerance only)")
    u.add_argument("--average", metavar="ALPHAS", help="weight averaging: the trained model averaged with the base, "
                   "alpha * new + (1 - alpha) * base, the largest of these comma-separated alphas the gate accepts "
                   "(e.g. 1,0.75,0.5,0.25)")
    u.add_argument("--cohort", help="train this cohort's own version (e.g. adapters): served to requests of the "
                   "cohort and to those the router sends it; gated as predict serves it")
    u.add_argument("--label-map", help="JSON/YAML file mapping raw labels (strings, aliases) to class ids")
    u.add_argument("--contradiction-threshold", type=float, default=0.9, help="flag labels the base model "
                   "contradicts with at least this confidence (default 0.9)")
    u.add_argument("--drop-contradicted", action="store_true", help="leave flagged labels out of training")
    u.add_argument("--slice", dest="slice_name", help="name of the recent slice (default NEW_DATA's file stem)")
    u.add_argument("--drift-label-shift", type=float, default=0.3, help="alert threshold, total variation")
    u.add_argument("--drift-confidence-shift", type=float, default=0.15, help="alert threshold")
    u.add_argument("--drift-ece", type=float, default=0.15, help="alert threshold")
    u.add_argument("--drift-cohort-error", type=float, default=0.5, help="alert threshold, per cohort")
    u.add_argument("--hold", action="store_true", help="a version that passes the gate stays a candidate for "
                   "`ecotrain canary` to promote (or `ecotrain promote`), instead of becoming current")
    u.add_argument("--progress", action="store_true", help="show the training progress")


def canary(c) -> None:
    c.add_argument("version", help="the candidate (`update --hold` made it on current)")
    c.add_argument("requests", metavar="REQUESTS", help="recorded requests with the labels they got: .npz of x, y "
                   "[, integer cohort]")
    c.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    c.add_argument("--mode", choices=["shadow", "split"], default="shadow", help="shadow (default): both versions "
                   "answer every request, paired; split: a share of the requests goes to the candidate (A/B)")
    c.add_argument("--share", type=float, default=0.2, help="split: the candidate's share of the requests (0.2)")
    c.add_argument("--max-drop", type=float, default=0.01, help="the rule: largest drop of accuracy allowed "
                   "(absolute, default 0.01), read on its 95%% interval")
    c.add_argument("--max-latency-ratio", type=float, default=1.25, help="the rule: largest ratio of median "
                   "latency per request, candidate over current (default 1.25)")
    c.add_argument("--seed", type=int, default=0, help="the split's draw and the bootstrap's (default 0)")
    c.add_argument("--cohort", help="every request is of this cohort (as predict's --cohort)")
    c.add_argument("--out", help="write the figures and the decision here (.json)")


def versions(v) -> None:
    v.add_argument("action", nargs="?", choices=["list", "add", "show"], default="list")
    v.add_argument("target", nargs="?", metavar="RUN|VERSION")
    v.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    v.add_argument("--data", help="add: the .npz whose test split (or whole) is the version's evaluation slice "
                   "(default: the run's test split)")
    v.add_argument("--slice", dest="slice_name", help="add: the slice's name (default the file stem, or `base`)")


def promote(p) -> None:
    p.add_argument("version")
    p.add_argument("--registry", default="registry", help=REGISTRY_HELP)


def rollback(r) -> None:
    r.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    r.add_argument("--cohort", help="roll back this cohort's version instead (to its previous one, or the base)")


def review_queue(q) -> None:
    q.add_argument("target", metavar="VERSION_OR_RUN", help="a version name, `current`, or a run/checkpoint folder")
    q.add_argument("data", metavar="DATA", help=".npz: x (and y for contradictions)")
    q.add_argument("--out", required=True, help="review.csv or review.json")
    q.add_argument("--top", type=int, default=50, help="how many of each kind (default 50)")
    q.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    q.add_argument("--label-map", help="as for update")
