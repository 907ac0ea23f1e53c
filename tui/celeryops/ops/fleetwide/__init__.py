"""What a run shares with the whole fleet through its Redis: the run lease, one run at a time (:mod:`.lease`), the
status mirrored for watchers (:mod:`.publish`) and read back as typed events (:mod:`.decode`)."""
