"""One training step's gradients through the loop's own backward, for tests of a method's loss terms
(the Objective adds them, as in training): replay's CE and DER++'s logit term."""

from types import SimpleNamespace

import torch


def step_grads(model, method, batch, accumulate, **state):
    """(each parameter's gradient, the step's loss parts) of one step of `method` on `batch`."""
    from ecotrain.core.distributed import Dist
    from ecotrain.core.loop import backward_micro_batches
    from ecotrain.methods import Methods
    from ecotrain.core.objective import Objective
    from ecotrain.core.precision import Precision
    from ecotrain.core.task import ClassificationTask

    model.zero_grad()
    st = SimpleNamespace(model=model, precision=Precision("fp32", torch.device("cpu")), dist=Dist(),
                         objective=Objective(ClassificationTask(), Methods([method])), task=ClassificationTask(),
                         device=torch.device("cpu"), **state)
    backward_micro_batches(st, batch, accumulate)
    return [p.grad.clone() for p in model.parameters()], st.loss_parts
