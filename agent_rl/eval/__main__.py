from agent_rl.eval.runner import cli

cli()
