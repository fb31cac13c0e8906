"""The columns of `rank-NNNNN.csv`, in ddpbench's order (src/record/rows.rs: `StepRow`'s
leading columns, one per `Phase`, its trailing columns). A unit test of ddpbench holds
this list to that header, so the two cannot drift apart."""

# BEGIN COLUMNS
COLUMNS = (
    "run_id",
    "rank",
    "node_type",
    "epoch",
    "step",
    "global_step",
    "warmup",
    "time_utc",
    "step_start_at_s",
    "samples",
    "data_s",
    "batch_copy_s",
    "forward_s",
    "backward_s",
    "comm_exposed_s",
    "optimizer_s",
    "other_s",
    "step_s",
    "comm_s",
    "comm_stage_d2h_s",
    "comm_stage_h2d_s",
    "comm_hidden_s",
    "comm_start_at_s",
    "comm_last_start_at_s",
    "loss",
    "bytes",
    "loss_scale",
    "step_skipped",
    "noise_batch_small",
    "grad_sq_small",
    "noise_batch_big",
    "grad_sq_big",
)
# END COLUMNS

# The phases of a step, in the order a step runs through them: they add up to step_s.
PHASES = ("data_s", "batch_copy_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s", "other_s")

# Files a run writes into its folder (src/train/run_folder.rs, `is_run_file`): a folder
# holding any of them is refused.
RUN_FILES = ("manifest.json", "epochs.csv", "clock.csv", "model.safetensors", "model.pt", "trace", ".ddpbench-reserve")
