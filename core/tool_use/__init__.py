"""Frames on request, the vocabulary every layer shares: the model's request and its checks
(:mod:`core.tool_use.requests`), the episode of turns and replies (:mod:`core.tool_use.episode`),
the tool's reply as a user turn holding a video segment (:mod:`core.tool_use.reply`) and where
an episode looked against the stretch that holds the answer (:mod:`core.tool_use.spans`)."""
