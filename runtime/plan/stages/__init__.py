"""The physical plan's stages: one contract per stage kind, one class per strategy
(runtime/plan/physical.py chooses them; runtime/job/epoch.py runs them)."""
