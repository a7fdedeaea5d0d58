"""The commands beside the training loops: `tandem quickstart` (a tiny model, task and run in one go),
`tandem generate` (n samples per prompt of a file, in this process or on replicas over Ray), `tandem export`
(a checkpoint as a Hugging Face folder) and the quickstart's plot of a run. Each is called by `cli.py` and
uses the trainer's loops and services; nothing below imports a command."""
