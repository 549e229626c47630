"""Measuring a run from the inside.

    profiler    StepProfiler: torch.profiler over the steps a ProfileSpec names, one trace per rank
    digest      the traces as compute / communication / idle shares and top operators (standard library only)
    timeline    each rank's compute / communication / idle spans and micro-batch actions, to draw
    intervals   the interval arithmetic the digest uses
    memory      exact bytes of model states and of the activations autograd saves
"""
