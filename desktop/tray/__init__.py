"""The tray icon, its state and menu, notifications and the quit dialog."""
