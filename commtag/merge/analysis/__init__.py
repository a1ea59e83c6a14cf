"""What the merged records say: clock alignment, matching, skew, bandwidth, desync."""
