"""Ground truth for the workplace_assistant example rollouts."""

# example_rollouts.jsonl rows carry no `ground_truth` (NeMo Gym's verify request had it; the recorded
# row does not). These are reconstructed from each prompt and the world, in WorkBench's style:
GOLD_FOR_ROLLOUTS = [
    # "Create a bar chart of total visits since November 30": today is 2023-11-30, so the range is that
    # one day. The model plotted 2023-11-30..2024-06-30, a different plot, hence the recorded 0.
    [("analytics_create_plot", {"time_min": "2023-11-30", "time_max": "2023-11-30",
                                "value_to_plot": "total_visits", "plot_type": "bar"})],
    # "...haven't responded to a proposal for the consulting product in 3 weeks to lost": the three
    # Consulting/Proposal customers were contacted on 11-20 or later, so nothing changes.
    [],
    [("customer_relationship_manager_delete_customer", {"customer_id": "00000014"})],  # Casey Wilson
    [("customer_relationship_manager_add_customer",
      {"customer_name": "Dakota Thomas", "assigned_to_email": "nadia.moreau@atlas.com", "status": "Lead"})],
    [("email_delete_email", {"email_id": "00000259"})],  # kofi's latest of 26 emails
]
