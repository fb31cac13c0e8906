//! Streaming a generated set: blocks read ahead on a thread, each checked against its
//! CRC32, turned into normalised batches.

use super::{Index, BLOCK_RECORDS, RECORD_BYTES};
use anyhow::Result;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use tch::{Kind, Tensor};

/// Streams records [start, end) block by block on a reader thread, verifying each
/// block's CRC, with at most `readahead` blocks in flight: memory stays at
/// readahead × 3.2 MB whatever the set's size.
pub struct BlockStream {
    rx: std::sync::mpsc::Receiver<Result<Vec<u8>>>,
    buffer: Vec<u8>,
    pos: usize,
}

impl BlockStream {
    pub fn new(dir: &Path, index: &Index, start: u64, end: u64, readahead: usize) -> BlockStream {
        let (tx, rx) = std::sync::mpsc::sync_channel(readahead.max(1));
        let (dir, index) = (dir.to_path_buf(), index.clone());
        std::thread::spawn(move || {
            let send = |r: Result<Vec<u8>>| tx.send(r).is_ok();
            for shard in index.shards.iter().filter(|s| s.first < end && s.first + s.samples > start) {
                let path = dir.join(&shard.file);
                let mut f = match std::fs::File::open(&path) {
                    Ok(f) => f,
                    Err(e) => {
                        send(Err(anyhow::anyhow!("{}: cannot open ({e})", path.display())));
                        return;
                    }
                };
                let first_block = (start.saturating_sub(shard.first) / BLOCK_RECORDS as u64) as usize;
                if f.seek(SeekFrom::Start(first_block as u64 * (BLOCK_RECORDS * RECORD_BYTES) as u64))
                    .is_err()
                {
                    send(Err(anyhow::anyhow!("{}: cannot seek", path.display())));
                    return;
                }
                for b in first_block..shard.block_crc32.len() {
                    let block_first = shard.first + (b * BLOCK_RECORDS) as u64;
                    if block_first >= end {
                        break;
                    }
                    let n = (shard.first + shard.samples - block_first).min(BLOCK_RECORDS as u64) as usize;
                    let mut buf = vec![0u8; n * RECORD_BYTES];
                    if let Err(e) = f.read_exact(&mut buf) {
                        send(Err(anyhow::anyhow!(
                            "{}: block {b} unreadable ({e}); run the same `ddpbench gen-bigmnist` command again to rewrite damaged shards",
                            path.display()
                        )));
                        return;
                    }
                    let mut crc = flate2::Crc::new();
                    crc.update(&buf);
                    if crc.sum() != shard.block_crc32[b] {
                        send(Err(anyhow::anyhow!(
                            "{}: block {b} is corrupt (CRC32 {:08x}, index says {:08x}). Run the same `ddpbench gen-bigmnist` command again: it re-checks every shard and rewrites damaged ones",
                            path.display(),
                            crc.sum(),
                            shard.block_crc32[b]
                        )));
                        return;
                    }
                    let lo = start.saturating_sub(block_first).min(n as u64) as usize;
                    let hi = (end - block_first).min(n as u64) as usize;
                    if !send(Ok(buf[lo * RECORD_BYTES..hi * RECORD_BYTES].to_vec())) {
                        return;
                    }
                }
            }
        });
        BlockStream {
            rx,
            buffer: Vec::new(),
            pos: 0,
        }
    }

    /// Up to `n` records (fewer only at the end of the range).
    pub fn take(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(n * RECORD_BYTES);
        while out.len() < n * RECORD_BYTES {
            if self.pos >= self.buffer.len() {
                match self.rx.recv() {
                    Ok(block) => {
                        self.buffer = block?;
                        self.pos = 0;
                    }
                    Err(_) => break,
                }
            }
            let want = n * RECORD_BYTES - out.len();
            let have = (self.buffer.len() - self.pos).min(want);
            out.extend_from_slice(&self.buffer[self.pos..self.pos + have]);
            self.pos += have;
        }
        Ok(out)
    }
}

/// Records to a normalised batch: images \[B, 1, 28, 28\] and labels \[B\].
pub fn records_to_batch(records: &[u8], mean: f64, std: f64) -> (Tensor, Tensor) {
    let b = records.len() / RECORD_BYTES;
    let labels: Vec<i64> = records.chunks(RECORD_BYTES).map(|r| r[0] as i64).collect();
    let pixels: Vec<u8> = records.chunks(RECORD_BYTES).flat_map(|r| r[1..].iter().copied()).collect();
    let x = (Tensor::from_slice(&pixels).view([b as i64, 1, 28, 28]).to_kind(Kind::Float) / 255.0 - mean) / std;
    (x, Tensor::from_slice(&labels))
}
