"""The drain: its engine and pure verdict (:mod:`.engine`), putting stopped consumers back (:mod:`.restore`), who is
gone by evidence (:mod:`.membership`), the run's fence kept up while it drains (:mod:`.runfence`) and patient retries
over a broker outage (:mod:`.retry`). Knows nothing of the journal: the run hands it write-ahead hooks."""
