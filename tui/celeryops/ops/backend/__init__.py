"""What the console reads and drives, without Textual: the backend (:mod:`.console`), the views it fills
(:mod:`.views`), fleet snapshots (:mod:`.snapshots`), run history (:mod:`.history`), releases (:mod:`.releases`) and
following a run another process holds (:mod:`.watch`)."""
