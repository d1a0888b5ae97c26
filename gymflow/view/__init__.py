"""`gymflow view`: a read-only web view of runs, rollouts and their conversations, served from the run store."""
