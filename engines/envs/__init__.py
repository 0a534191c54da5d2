"""Engine virtual environments: install, find, doctor, remove; pip's progress; the
steps and types shared with the engine-specific installers."""
