"""The training program and the contract. Imports nothing heavy: the web process uses trainer.contract."""
