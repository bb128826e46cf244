//! The epoch loop around [`Trainer::train_step`]: where each epoch starts (mid-epoch after a resume), how
//! often a metrics line goes out, the end-of-epoch evaluation, when to checkpoint and how a stop request
//! ends the run, and `result.json`.

use std::time::{Duration, Instant};

use anyhow::Result;
use ringtrain_core::timeline::bubble_share;

use super::{guard, JobError, StepOutcome, Stopped, Trainer};
use crate::checkpoint::{self, PartialEpoch};
use crate::data::shuffle::batch_indices;
use crate::data::Labels;
use crate::metrics::{EpochRecord, ErrorMetric, Metric, RunResult, Timeline};
use crate::process_usage::ProcessUsage;

impl Trainer<'_> {
    /// Trains from the start epoch to the end, reporting through `sink`; rank 0 writes checkpoints and
    /// `result.json`.
    pub fn run(&mut self, sink: &mut dyn FnMut(&Metric)) -> Result<RunResult> {
        let run_started = Instant::now();
        let start_up = run_started.saturating_duration_since(self.spent.began);
        let (mut training_time, mut trained_steps) = (Duration::ZERO, 0u64);
        for epoch in self.start_epoch()..u64::from(self.effective.epochs) {
            let started = Instant::now();
            let progress = self.train_epoch(epoch, started, sink)?;
            training_time += started.elapsed();
            trained_steps += self.effective.iterations_per_epoch - progress.first_step;
            self.end_epoch(epoch, &progress, started, sink)?;
        }
        let mut result = self.result(run_started, start_up, training_time, trained_steps);
        if self.options.pipeline.is_some() {
            let stages = self.stage_times()?;
            result.timeline.bubble_share = bubble_share(stages.len(), self.virtual_ranks());
            result.timeline.stages = stages;
        }
        if let Some(out) = self.options.out_dir.as_ref().filter(|_| self.is_root()) {
            checkpoint::write_atomically(&out.join("result.json"), &serde_json::to_vec_pretty(&result)?)?;
        }
        Ok(result)
    }

    /// Where epoch `epoch` starts: at its first step with nothing summed yet, or, in the epoch a run resumed
    /// in, at the step it stopped before with the sums the epoch had then.
    fn epoch_start(&self, epoch: u64) -> EpochProgress {
        if epoch == self.start_epoch() {
            let first_step = self.start.next_iteration - epoch * self.effective.iterations_per_epoch;
            EpochProgress { first_step, sums: self.start.partial, stop: false }
        } else {
            EpochProgress { first_step: 0, sums: PartialEpoch::default(), stop: false }
        }
    }

    /// The order of epoch `epoch`'s samples (what [`Trainer::train_step`] takes), the data told which
    /// batches this process will ask for from step `first_step` on: each step, each of its virtual ranks
    /// (a sharded data set decodes them ahead, in that order).
    pub fn begin_epoch(&mut self, epoch: u64, first_step: u64) -> Vec<i64> {
        let permutation = self.data.epoch_order(self.spec.seed, epoch);
        let (ipe, n) = (self.effective.iterations_per_epoch as usize, self.spec.per_worker_batch as usize);
        let (rank, virtual_ranks, total_ranks) = (self.comm.rank(), self.virtual_ranks(), self.total_ranks);
        self.data.begin_epoch(epoch, || {
            (first_step as usize..ipe)
                .flat_map(|t| (0..virtual_ranks).map(move |j| (t, rank * virtual_ranks + j)))
                .map(|(t, worker)| batch_indices(&permutation, total_ranks, worker, t, n).to_vec())
                .collect()
        });
        permutation
    }

    /// Trains epoch `epoch` (begun at `started`), with a metrics line every `log_every_iterations` and at
    /// the epoch's last step. A stop asked for before the last step ends the run here, with a checkpoint
    /// of exactly this point and the epoch's sums so far.
    fn train_epoch(&mut self, epoch: u64, started: Instant, sink: &mut dyn FnMut(&Metric)) -> Result<EpochProgress> {
        let ipe = self.effective.iterations_per_epoch;
        let log_every = u64::from(self.spec.log_every_iterations.max(1));
        let mut progress = self.epoch_start(epoch);
        let permutation = self.begin_epoch(epoch, progress.first_step);
        let mut window = LogWindow::new();
        for t in progress.first_step..ipe {
            let iteration = epoch * ipe + t;
            let step_started = Instant::now();
            let outcome = self.train_step(iteration, t as usize, &permutation)?;
            self.spent.steps += step_started.elapsed();
            progress.sums.loss_sum += outcome.loss;
            progress.sums.wrong_sum += outcome.wrong;
            window.steps += 1;
            window.allreduce += outcome.allreduce;
            if (iteration + 1) % log_every == 0 || t + 1 == ipe {
                let line = self.iteration_line(epoch, iteration, &outcome, &window);
                self.report(sink, &line);
                window = LogWindow::new();
            }
            progress.stop = outcome.stop;
            if progress.stop && t + 1 < ipe {
                let seconds = progress.sums.seconds + started.elapsed().as_secs_f64();
                self.write_checkpoint(iteration + 1, Some(PartialEpoch { seconds, ..progress.sums }))?;
                return Err(Stopped { next_iteration: Some(iteration + 1) }.into());
            }
        }
        Ok(progress)
    }

    /// The metrics line of `iteration`, with the throughput and all-reduce time since the previous line.
    fn iteration_line(&self, epoch: u64, iteration: u64, outcome: &StepOutcome, window: &LogWindow) -> Metric {
        let elapsed = window.started.elapsed().as_secs_f64().max(1e-9);
        let usage = ProcessUsage::now();
        Metric::Iteration {
            rank: self.comm.rank(),
            epoch,
            iteration,
            lr: outcome.lr,
            loss: outcome.loss,
            rank_loss: outcome.rank_loss,
            samples_per_s: window.steps as f64 * self.effective.global_batch as f64 / elapsed,
            allreduce_s: window.allreduce.as_secs_f64(),
            allreduce_share: (window.allreduce.as_secs_f64() / elapsed).min(1.0),
            cpu_cores: usage.cores_since(&window.usage),
            peak_rss_bytes: usage.peak_rss_bytes as f64,
        }
    }

    /// Evaluates the trained epoch, reports and records it, then checkpoints as the spec asks.
    fn end_epoch(
        &mut self,
        epoch: u64,
        progress: &EpochProgress,
        started: Instant,
        sink: &mut dyn FnMut(&Metric),
    ) -> Result<()> {
        let evaluation_started = Instant::now();
        let (test_error, test_loss) = self.evaluate()?;
        self.spent.evaluation += evaluation_started.elapsed();
        let ipe = self.effective.iterations_per_epoch;
        let record = EpochRecord {
            rank: self.comm.rank(),
            epoch,
            iteration: (epoch + 1) * ipe - 1,
            train_loss: progress.sums.loss_sum / ipe as f64,
            train_error: self.error_from(progress.sums.wrong_sum, ipe as f64 * self.effective.global_batch as f64),
            test_error,
            test_loss,
            seconds: progress.sums.seconds + started.elapsed().as_secs_f64(),
        };
        self.report(sink, &Metric::Epoch(record.clone()));
        // every rank sees the same all-reduced error, so all stop here together
        if self.spec.guard.collapse {
            if let Some(why) = guard::collapse(&record, &self.effective, self.data.classes(), self.comm.world_size()) {
                return Err(JobError(why).into());
            }
        }
        self.history.push(record);
        self.checkpoint_after_epoch(epoch + 1, progress.stop)
    }

    /// Checkpoints after the last epoch, every `checkpoint_every_epochs` epochs, and when the epoch's last
    /// step asked to stop: that checkpoint serves the stop, which then ends the run unless it ended anyway.
    fn checkpoint_after_epoch(&mut self, done: u64, stop: bool) -> Result<()> {
        let epochs = u64::from(self.effective.epochs);
        let every = u64::from(self.spec.checkpoint_every_epochs);
        let next_iteration = done * self.effective.iterations_per_epoch;
        if done == epochs || (every > 0 && done % every == 0) || stop {
            self.write_checkpoint(next_iteration, None)?;
        }
        if stop && done < epochs {
            return Err(Stopped { next_iteration: Some(next_iteration) }.into());
        }
        Ok(())
    }

    /// Sends a metrics line, counting the time it takes.
    fn report(&mut self, sink: &mut dyn FnMut(&Metric), metric: &Metric) {
        let started = Instant::now();
        sink(metric);
        self.spent.reporting += started.elapsed();
    }

    /// `result.json`: the curves, the throughput of the `trained_steps` steps taken in `training_time`
    /// (evaluation excluded), and where the time went.
    fn result(
        &self,
        run_started: Instant,
        start_up: Duration,
        training_time: Duration,
        trained_steps: u64,
    ) -> RunResult {
        let eff = &self.effective;
        let wall = run_started.elapsed().as_secs_f64();
        let spent = &self.spent;
        let accounted = spent.steps + spent.evaluation + spent.checkpoint + spent.reporting;
        let timeline = Timeline {
            start_up_s: start_up.as_secs_f64(),
            train_steps_s: spent.steps.as_secs_f64(),
            evaluation_s: spent.evaluation.as_secs_f64(),
            checkpoint_s: spent.checkpoint.as_secs_f64(),
            reporting_s: spent.reporting.as_secs_f64(),
            other_s: (wall - accounted.as_secs_f64()).max(0.0),
            ..Default::default()
        };
        RunResult {
            spec: self.spec.clone(),
            effective: eff.clone(),
            schedule: eff.render(false),
            epochs: self.history.clone(),
            final_test_error: self.history.last().map_or(f64::NAN, |r| r.test_error),
            wall_seconds: wall,
            samples_per_s: trained_steps as f64 * eff.global_batch as f64 / training_time.as_secs_f64().max(1e-9),
            communication_fraction: self.times.allreduce.as_secs_f64() / self.times.total().as_secs_f64().max(1e-9),
            processes: self.comm.world_size(),
            virtual_ranks: self.virtual_ranks(),
            error_metric: match self.data.labels {
                Labels::Classes(_) => ErrorMetric::ErrorRate,
                Labels::Values { .. } => ErrorMetric::Rmse,
            },
            timeline,
        }
    }
}

/// An epoch's training so far.
#[derive(Debug, Clone, Copy)]
struct EpochProgress {
    /// The step it started at: 0, or where a stopped run resumed.
    first_step: u64,
    /// Its running loss and error sums, and the seconds it ran before a stop (when resumed in it).
    sums: PartialEpoch,
    /// Its latest step asked to stop.
    stop: bool,
}

/// The iterations since the previous metrics line.
#[derive(Debug)]
struct LogWindow {
    started: Instant,
    steps: u64,
    allreduce: Duration,
    /// The process's CPU time and memory when the window began.
    usage: ProcessUsage,
}

impl LogWindow {
    fn new() -> LogWindow {
        LogWindow { started: Instant::now(), steps: 0, allreduce: Duration::ZERO, usage: ProcessUsage::now() }
    }
}
