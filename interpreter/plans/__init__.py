"""Plans: pure functions of a checked program (no torch). The passes, in order, composed by
`plan.make_plan`; each is named by the record it derives:

`clocks.plan_clocks` -> `ClockPlan`, `trace.trace_shapes` -> `Trace`, `allocation.schedule_allocations`
-> `AllocationSchedule`, `arena.plan_arena` -> `ArenaPlan`, `capture.plan_capture` -> `CapturePlan`,
`samples.account_samples` -> `SampleAccount`.
"""
