"""Pure reward functions and the parsing they share (answer extraction, choice letters).

Entry points: ``registry.get_reward(name)`` and ``combine.compute_rewards(specs, completions, fields)``.
"""
