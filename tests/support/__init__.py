"""The helpers the tests share: agents, envs, factories, process checks and run helpers."""
