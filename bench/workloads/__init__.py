"""One module per workload. Each holds CONTENDERS: a library's name -> a function of the size that returns a Contender."""
