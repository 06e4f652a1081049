"""node-check on the client: the run, the baseline, the actions view, Slurm drain and undrain,
the Prometheus textfile."""
