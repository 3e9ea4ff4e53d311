"""The synthetic world's experiments: the demo and the paper's Tables 1-3 at CPU scale."""
