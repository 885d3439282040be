"""Real servers: frontend, local and ray runtimes, executors, KV transport."""
