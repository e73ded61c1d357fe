"""Savepoints: user-triggered, self-contained, relocatable copies of a job's state in a
canonical, backend-independent format (`format`: the per-operator, per-key-group state files;
`values`: how a state value is encoded in them; `export`: readable exports).
"""
