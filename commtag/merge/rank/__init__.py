"""One rank's pass: its trace converted, then the annotations attached by source."""
