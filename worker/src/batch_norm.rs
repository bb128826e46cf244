//! The running BatchNorm statistics of this process's ranks, as flat host tables.
//!
//! They are per rank and never synchronised (Goyal §2.3): each rank normalises over its own n samples. A
//! process playing v virtual ranks keeps one table per virtual rank and swaps it into the model's buffers
//! around that rank's micro-batch, so v virtual ranks keep exactly the statistics v real ranks would.

use tch::nn::VarStore;
use tch::Tensor;

use crate::collective::{from_host, to_host, Collective, CommResult};

#[derive(Debug)]
pub(crate) struct BatchNormState {
    /// The model's buffers (the variables without gradients), sorted by name: the order of every table.
    buffers: Vec<(String, Tensor)>,
    /// v: the ranks this process plays.
    virtual_ranks: usize,
    /// One table per virtual rank when v > 1; empty when v = 1, where the live buffers are the only table.
    tables: Vec<Vec<f32>>,
}

impl BatchNormState {
    pub(crate) fn new(vs: &VarStore, virtual_ranks: usize) -> BatchNormState {
        let mut buffers: Vec<(String, Tensor)> =
            vs.variables().into_iter().filter(|(_, t)| !t.requires_grad()).collect();
        buffers.sort_by(|a, b| a.0.cmp(&b.0));
        let mut state = BatchNormState { buffers, virtual_ranks, tables: Vec::new() };
        let initial = state.snapshot();
        state.tables = vec![initial; if virtual_ranks > 1 { virtual_ranks } else { 0 }];
        state
    }

    /// The buffers, name-sorted: a table is their values one after the other, in this order.
    pub(crate) fn buffers(&self) -> &[(String, Tensor)] {
        &self.buffers
    }

    /// The length of one rank's table.
    pub(crate) fn len(&self) -> usize {
        self.buffers.iter().map(|(_, t)| t.numel()).sum()
    }

    /// The live buffers as a table.
    pub(crate) fn snapshot(&self) -> Vec<f32> {
        let mut table = Vec::new();
        to_host(self.buffers.iter().map(|(_, t)| t), &mut table);
        table
    }

    /// Loads a table into the live buffers. It writes through `.data()` (the same memory, its own version
    /// counter): BatchNorm's backward keeps the running statistics it was given, for evaluation-mode
    /// gradients, and autograd refuses a backward after they changed in place; a training-mode backward
    /// never reads them, and a pipeline stage swaps micro-batch j+1's statistics in before micro-batch j's
    /// backward (see [`crate::pipeline::schedule`]).
    pub(crate) fn restore(&self, table: &[f32]) {
        let live: Vec<Tensor> = self.buffers.iter().map(|(_, t)| t.data()).collect();
        from_host(table, live.iter());
    }

    /// The table of virtual rank j of this process (the live buffers when v = 1).
    pub(crate) fn table(&self, j: usize) -> Vec<f32> {
        if self.tables.is_empty() {
            self.snapshot()
        } else {
            self.tables[j].clone()
        }
    }

    fn set_table(&mut self, j: usize, table: Vec<f32>) {
        if self.tables.is_empty() {
            self.restore(&table);
        } else {
            self.tables[j] = table;
        }
    }

    /// Puts virtual rank j's statistics into the model before its micro-batch (nothing to do when v = 1).
    pub(crate) fn swap_in(&self, j: usize) {
        if !self.tables.is_empty() {
            self.restore(&self.tables[j]);
        }
    }

    /// Keeps what virtual rank j's micro-batch made of its statistics (nothing to do when v = 1).
    pub(crate) fn swap_out(&mut self, j: usize) {
        if !self.tables.is_empty() {
            self.tables[j] = self.snapshot();
        }
    }

    /// Loads rank 0's statistics into the model on every rank (evaluation uses them, as PyTorch DDP does).
    pub(crate) fn load_rank0(&self, comm: &mut dyn Collective) -> CommResult<()> {
        if self.len() > 0 {
            let mut rank0 = self.table(0);
            comm.broadcast(&mut rank0, 0)?;
            self.restore(&rank0);
        }
        Ok(())
    }

    /// Every rank's table, gathered on all ranks with an all-reduce of a zeroed table in which each rank fills
    /// its own slots. Indexed by virtual rank: rank r's table is `[r * len .. (r + 1) * len]`.
    pub(crate) fn gather(&self, comm: &mut dyn Collective, total_ranks: usize) -> CommResult<Vec<f32>> {
        let b = self.len();
        let mut all = vec![0.0f32; b * total_ranks];
        let first = comm.rank() * self.virtual_ranks;
        for j in 0..self.virtual_ranks {
            all[(first + j) * b..(first + j + 1) * b].copy_from_slice(&self.table(j));
        }
        comm.all_reduce_sum(&mut all)?;
        Ok(all)
    }

    /// Takes this process's tables from `all`, laid out as [`BatchNormState::gather`] returns it.
    pub(crate) fn scatter(&mut self, all: &[f32], rank: usize) {
        let b = self.len();
        let first = rank * self.virtual_ranks;
        for j in 0..self.virtual_ranks {
            let vr = first + j;
            self.set_table(j, all[vr * b..(vr + 1) * b].to_vec());
        }
    }
}
