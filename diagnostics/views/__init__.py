"""What a person or a program reads: the folded table, JSON, drift between targets; each
writes to a stream it is given."""
