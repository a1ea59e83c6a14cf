"""What commtag puts into torch: the collective wrappers, their idle fast path, c10d's hooks, and install/uninstall."""
