"""stacks on the client: the run, the fold across ranks, flight-recorder dumps, py-spy upload."""
