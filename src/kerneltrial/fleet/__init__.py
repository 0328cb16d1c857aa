"""Fleet runs: one protocol over several devices of a Ray cluster (`kerneltrial run --ray`).

pieces.py cuts the protocol into the work units' protocols; worker.py is one unit's Ray task
(a fresh `kerneltrial run` process on the task's device); driver.py plans the units, schedules
them, records what each did and combines the figures (fleet/record.py). Ray is imported
inside functions only: this package imports without it.
"""
