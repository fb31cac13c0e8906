//! The batches of one epoch on one rank: prepared inline, on worker threads, or
//! streamed from bigMNIST's shards.

use super::{bigmnist, Batches, Split, StreamSource};
use anyhow::{anyhow, Result};
use std::time::Instant;
use tch::{Device, Tensor};

/// Spans kept between two [`Loader::take_spans`] at most: a step takes a few batches, so
/// a caller that stops taking them loses spans rather than growing memory.
const MAX_KEPT_SPANS: usize = 4096;

/// When a worker thread prepared one batch, on the host clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchSpan {
    /// The worker, from 0.
    pub worker: usize,
    /// The batch's place in the epoch, from 0.
    pub batch: usize,
    pub start: Instant,
    pub end: Instant,
}

/// A prepared batch and when it was prepared.
type Prepared = (Result<(Tensor, Tensor)>, BatchSpan);

/// The most batch-preparing threads one process may start on a node with `online_cpus`
/// hardware threads: 4 per hardware thread (room for threads that wait on reads), at
/// most 256 and at least 8, so a typo such as 100000 is refused before a thread starts.
pub(crate) fn max_workers(online_cpus: usize) -> usize {
    256.min(4 * online_cpus).max(8)
}

/// Batches of one epoch, in order: prepared inline, or ahead of time by worker
/// threads (worker w prepares batches w, w+N, …) each behind a queue of two, so at
/// most 2N batches wait in memory.
pub(crate) struct Loader {
    stream: Option<(bigmnist::BlockStream, usize, f64, f64)>,
    /// Inline: the split, the batches and the next one to take, where to pin them.
    source: Option<(Split, Batches, usize, Option<Device>)>,
    queues: Vec<std::sync::mpsc::Receiver<Prepared>>,
    next: usize,
    remaining: usize,
    /// The spans of the batches handed out since the last take, when recorded.
    spans: Option<Vec<BatchSpan>>,
}

impl Loader {
    /// Batches bound for a GPU (`device`) are built in page-locked memory so that copying
    /// them to the device does not wait for the host: by the workers, or inline when they
    /// are decoded images. A worker thread the system will not start is an error; the
    /// workers already started then stop at their first batch.
    /// The batches' samples are computed as they are prepared, so nothing held grows with
    /// the split or the epoch.
    pub(crate) fn new(split: &Split, batches: Batches, workers: usize, device: Device) -> Result<Loader> {
        let remaining = batches.len();
        let pin = (device != Device::Cpu).then_some(device);
        if workers == 0 {
            return Ok(Loader {
                stream: None,
                // Inline, rows held in memory would be copied into page-locked memory on
                // the step's critical path; images are decoded straight into it.
                source: Some((split.share(), batches, 0, pin.filter(|_| split.files.is_some()))),
                queues: Vec::new(),
                next: 0,
                remaining,
                spans: None,
            });
        }
        let queues = (0..workers)
            .map(|w| {
                let (tx, rx) = std::sync::mpsc::sync_channel(2);
                let data = split.share();
                std::thread::Builder::new()
                    .name(format!("ddpbench-batch-{w}"))
                    .spawn(move || {
                        for b in (w..batches.len()).step_by(workers) {
                            let start = Instant::now();
                            let batch = data.host_batch(&Tensor::from_slice(&batches.get(b)), pin);
                            let span = BatchSpan {
                                worker: w,
                                batch: b,
                                start,
                                end: Instant::now(),
                            };
                            // A closed queue means the epoch ended early: stop quietly.
                            if tx.send((batch, span)).is_err() {
                                return;
                            }
                        }
                    })
                    .map_err(|e| anyhow!("cannot start batch worker thread {} of {workers} ({e}); lower --workers", w + 1))?;
                Ok(rx)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Loader {
            stream: None,
            source: None,
            queues,
            next: 0,
            remaining,
            spans: None,
        })
    }

    /// `batches` batches of `batch` records streamed from rank `rank`'s range of `src`,
    /// read ahead by a reader thread (`readahead` blocks of 4096 records).
    pub(crate) fn stream(src: &StreamSource, rank: usize, size: usize, batch: usize, batches: usize, readahead: usize) -> Loader {
        let (start, end) = bigmnist::rank_range(&src.index, rank, size);
        let reader = bigmnist::BlockStream::new(&src.dir, &src.index, start, end, readahead);
        Loader {
            stream: Some((reader, batch, src.index.mean, src.index.std)),
            source: None,
            queues: Vec::new(),
            next: 0,
            remaining: batches,
            spans: None,
        }
    }

    /// From now on keeps when the worker threads prepared each batch handed out, for
    /// [`Loader::take_spans`] (batches prepared inline or streamed have none).
    pub(crate) fn record_spans(&mut self) {
        self.spans = Some(Vec::new());
    }

    /// The spans of the batches handed out since the last take, in the order handed out.
    pub(crate) fn take_spans(&mut self) -> Vec<BatchSpan> {
        self.spans.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The next batch in host memory, or None at the end of the epoch.
    pub(crate) fn next_batch(&mut self) -> Option<Result<(Tensor, Tensor)>> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let batch = if let Some((reader, n, mean, std)) = &mut self.stream {
            Some(reader.take(*n).map(|records| bigmnist::records_to_batch(&records, *mean, *std)))
        } else {
            match &mut self.source {
                Some((split, batches, next, pin)) => (*next < batches.len()).then(|| {
                    *next += 1;
                    split.host_batch(&Tensor::from_slice(&batches.get(*next - 1)), *pin)
                }),
                None => self.queues[self.next % self.queues.len()].recv().ok().map(|(batch, span)| {
                    if let Some(kept) = self.spans.as_mut().filter(|k| k.len() < MAX_KEPT_SPANS) {
                        kept.push(span);
                    }
                    batch
                }),
            }
        };
        self.next += 1;
        batch
    }
}
