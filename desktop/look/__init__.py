"""The app's look: theme and palette, window styles, how numbers are written."""
