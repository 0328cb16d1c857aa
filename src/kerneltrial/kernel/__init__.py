"""A kernel run's evidence: its summary, its independent verifier and its report (docs/DESIGN.md, "Where each thing lives").

Floor 2: imports rundir, stats, gate_rule and publication only; the combinations of kernel runs
(replicates/, suite/, fleet/) and what spans kinds (analysis/) build on it.
"""
