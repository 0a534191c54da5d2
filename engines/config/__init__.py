"""Settings and where they live: config.toml's sections (sections.py), every path traylm
uses (paths.py, without the settings' classes), live settings, profiles, fields and files."""
