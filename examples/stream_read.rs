//! Streams a bigMNIST set as one rank of `ranks` would (one reader thread, block
//! read-ahead, CRC checks, batches normalised into tensors) and reports samples/s and
//! peak memory:  cargo run --release --example stream_read -- DIR [BATCH=64]
use ddpbench::data::bigmnist::{open, rank_range, records_to_batch, BlockStream};
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).expect("usage: stream_read DIR [BATCH]"));
    let batch: usize = std::env::args().nth(2).map(|b| b.parse()).transpose()?.unwrap_or(64);
    tch::set_num_threads(1);
    let index = open(&dir)?;
    let (start, end) = rank_range(&index, 0, 1);
    let t = std::time::Instant::now();
    let mut stream = BlockStream::new(&dir, &index, start, end, 4);
    let mut samples = 0usize;
    let mut checksum = 0i64;
    loop {
        let records = stream.take(batch)?;
        if records.is_empty() {
            break;
        }
        let (x, y) = records_to_batch(&records, index.mean, index.std);
        samples += y.size()[0] as usize;
        checksum += y.sum(tch::Kind::Int64).int64_value(&[]) + x.size()[0];
    }
    let secs = t.elapsed().as_secs_f64();
    let status = std::fs::read_to_string("/proc/self/status")?;
    let hwm = status.lines().find(|l| l.starts_with("VmHWM")).unwrap_or("").to_string();
    println!("ddpbench stream: {samples} samples in {secs:.2} s = {:.0} samples/s (1 reader thread, batch {batch}); peak {hwm}; checksum {checksum}", samples as f64 / secs);
    Ok(())
}
