//! Parameters and optimizer state in flat buffers laid out as the flat gradient buckets
//! (PyTorch DDP's `gradient_as_bucket_view`): each parameter's data becomes a view of its
//! bucket's parameter buffer at its gradient's offset and strides, and each state tensor
//! a view of a state buffer alike. An element-wise update then runs once over a bucket's
//! buffers instead of once per parameter: a handful of kernels per bucket rather than per
//! parameter, each element computed by the same operations (the same bits).

use tch::Tensor;

/// Where each parameter's gradient sits in the flat gradient buckets: what the buckets'
/// owner tells an optimizer so that it can lay the parameters out alike.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct FlatLayout {
    /// Elements of each bucket's buffer.
    pub numels: Vec<usize>,
    /// Each parameter's place, in the parameters' fixed order.
    pub slots: Vec<Slot>,
}

/// One parameter's place in a flat bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    pub bucket: usize,
    /// Where its first element sits, in elements of the bucket's dtype.
    pub offset: i64,
    /// The strides of its view of the bucket.
    pub strides: Vec<i64>,
}

/// True when `stride` visits each of the `size` elements once with no gap: sorted by
/// stride, each dimension's stride is the product of the sizes before it (dimensions of
/// size 1 are never stepped and may have any stride).
pub(crate) fn is_dense(size: &[i64], stride: &[i64]) -> bool {
    if size.len() != stride.len() {
        return false;
    }
    let mut dims: Vec<usize> = (0..size.len()).filter(|&d| size[d] != 1).collect();
    dims.sort_by_key(|&d| stride[d]);
    let mut expected = 1i64;
    for d in dims {
        if stride[d] != expected {
            return false;
        }
        expected = expected.saturating_mul(size[d]);
    }
    true
}

/// Which parameters an optimizer updates bucket by bucket over flat buffers, and which
/// one by one.
pub(super) struct Flat {
    /// The buckets updated whole: each bucket's index among the gradient buffers, the
    /// parameter buffer its members are views of, and its members.
    buckets: Vec<(usize, Tensor, Vec<usize>)>,
    /// The parameters updated one by one: in no flat bucket.
    alone: Vec<usize>,
    /// Every parameter's place (empty without flat buckets).
    slots: Vec<Slot>,
}

impl Flat {
    /// Every one of `count` parameters updated alone.
    pub(super) fn none(count: usize) -> Flat {
        Flat {
            buckets: Vec::new(),
            alone: (0..count).collect(),
            slots: Vec::new(),
        }
    }

    /// Moves the data of `params` into flat per-bucket buffers laid out as `layout`
    /// says, each parameter a view of its bucket's buffer (its values and its own
    /// strides kept; modules and the gradients see the same tensors). A bucket whose
    /// members cannot be laid out so (see [`Flat::fits`]) keeps its parameters as they
    /// are, updated one by one. Elements no parameter covers stay 0 in every buffer,
    /// gradients included, and an update of zeros leaves zeros (SGD and Adam).
    pub(super) fn adopt(params: &[Tensor], layout: &FlatLayout) -> Flat {
        if layout.slots.len() != params.len() {
            return Flat::none(params.len());
        }
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); layout.numels.len()];
        for (p, slot) in layout.slots.iter().enumerate() {
            match members.get_mut(slot.bucket) {
                Some(m) => m.push(p),
                None => return Flat::none(params.len()),
            }
        }
        let mut flat = Flat {
            buckets: Vec::new(),
            alone: Vec::new(),
            slots: layout.slots.clone(),
        };
        tch::no_grad(|| {
            for (b, m) in members.into_iter().enumerate() {
                if !Flat::fits(params, &layout.slots, &m, layout.numels[b]) {
                    flat.alone.extend(&m);
                    continue;
                }
                let buffer = flat.buffer(params, &m, layout.numels[b]);
                for &p in &m {
                    let view = flat.view(&buffer, p, &params[p]);
                    params[p].shallow_clone().set_data(&view);
                }
                flat.buckets.push((b, buffer, m));
            }
        });
        flat.alone.sort_unstable();
        flat
    }

    /// Whether bucket `members` (parameter indexes) can share one flat buffer of `numel`
    /// elements: one dtype and device, each view of the buffer in its parameter's own
    /// strides and dense, inside the buffer, and no two overlapping.
    fn fits(params: &[Tensor], slots: &[Slot], members: &[usize], numel: usize) -> bool {
        let Some(&first) = members.first() else { return false };
        let (kind, device) = (params[first].kind(), params[first].device());
        let mut spans: Vec<(i64, i64)> = Vec::with_capacity(members.len());
        for &p in members {
            let (t, slot) = (&params[p], &slots[p]);
            let size = t.size();
            if t.kind() != kind || t.device() != device || t.stride() != slot.strides || !is_dense(&size, &slot.strides) {
                return false;
            }
            spans.push((slot.offset, slot.offset + t.numel() as i64));
        }
        spans.sort_unstable();
        let inside = spans.first().is_some_and(|s| s.0 >= 0) && spans.last().is_some_and(|s| s.1 <= numel as i64);
        inside && spans.windows(2).all(|w| w[0].1 <= w[1].0)
    }

    /// A zeroed buffer of `numel` elements in the members' dtype with each member's
    /// values copied to its place.
    fn buffer(&self, tensors: &[Tensor], members: &[usize], numel: usize) -> Tensor {
        let like = &tensors[members[0]];
        let buffer = Tensor::zeros([numel as i64], (like.kind(), like.device()));
        for &p in members {
            self.view(&buffer, p, &tensors[p]).copy_(&tensors[p]);
        }
        buffer
    }

    /// Parameter `p`'s view of a bucket `buffer`, shaped as `like`.
    fn view(&self, buffer: &Tensor, p: usize, like: &Tensor) -> Tensor {
        let slot = &self.slots[p];
        buffer.as_strided(like.size().as_slice(), slot.strides.as_slice(), slot.offset)
    }

    /// Lays one per-parameter state (`state[p]` alike in shape and layout to parameter p)
    /// out as the parameters: for each flat bucket a buffer holding its members' state,
    /// and each member's `state[p]` re-made as a view of it (its values kept). Returns
    /// the buffers, in the order of [`Flat::buckets`].
    pub(super) fn lay_out(&self, state: &mut [Tensor]) -> Vec<Tensor> {
        tch::no_grad(|| {
            self.buckets
                .iter()
                .map(|(_, params, members)| {
                    let buffer = self.buffer(state, members, params.numel());
                    for &p in members {
                        state[p] = self.view(&buffer, p, &state[p]);
                    }
                    buffer
                })
                .collect()
        })
    }

    /// The flat buckets: each one's index among the gradient buffers and its parameter buffer.
    pub(super) fn buckets(&self) -> impl Iterator<Item = (usize, &Tensor)> {
        self.buckets.iter().map(|(b, t, _)| (*b, t))
    }

    /// How many buckets are updated whole.
    pub(super) fn count(&self) -> usize {
        self.buckets.len()
    }

    /// What one step updates, in order: each flat bucket's parameter buffer with its
    /// gradient buffer from `grads` (bucket b's at index b) and its buffers of
    /// `flat_state`, then each parameter alone with its gradient and its tensors of
    /// `state` (a parameter without a gradient is left out). `flat_state` holds, for each
    /// kind of state, the buffers [`Flat::lay_out`] returned; `state` the per-parameter tensors.
    pub(super) fn targets(&self, params: &[Tensor], grads: &[Tensor], flat_state: &[&[Tensor]], state: &[&[Tensor]]) -> Vec<Target> {
        let whole = self.buckets().enumerate().map(|(k, (b, w))| Target {
            g: Flat::gradient(grads, b, w).shallow_clone(),
            w: w.shallow_clone(),
            state: flat_state.iter().map(|s| s[k].shallow_clone()).collect(),
        });
        let alone = self.alone.iter().filter_map(|&i| {
            let g = params[i].grad();
            g.defined().then(|| Target {
                w: params[i].shallow_clone(),
                g,
                state: state.iter().map(|s| s[i].shallow_clone()).collect(),
            })
        });
        whole.chain(alone).collect()
    }

    /// The gradient buffer of flat bucket `b` in `grads`, checked to be one the bucket's
    /// parameter buffer can be updated from.
    fn gradient<'g>(grads: &'g [Tensor], b: usize, params: &Tensor) -> &'g Tensor {
        let g = grads.get(b).unwrap_or_else(|| {
            panic!(
                "the optimizer updates over {} or more flat buckets but was given {} gradient buffers (internal error)",
                b + 1,
                grads.len()
            )
        });
        assert!(
            g.numel() == params.numel() && g.kind() == params.kind() && g.device() == params.device(),
            "gradient buffer {b} ({} {:?} elements) does not match its parameter buffer ({} {:?}) (internal error)",
            g.numel(),
            g.kind(),
            params.numel(),
            params.kind()
        );
        g
    }
}

/// One element-wise update's tensors: parameters (a bucket's buffer or one parameter),
/// their gradient, and their state alike.
pub(super) struct Target {
    pub w: Tensor,
    pub g: Tensor,
    pub state: Vec<Tensor>,
}
