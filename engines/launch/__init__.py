"""`traylm launch claude|codex|opencode`: an agent CLI run pointed at traylm."""
