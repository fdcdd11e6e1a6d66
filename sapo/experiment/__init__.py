"""`sapo experiment`: the paper's I/J comparison, run through the real services, several seeds."""
