"""The agents (PPO, GRPO) and the pure functions they share."""
