//! The discrete-event queue: events ordered by (time, insertion sequence),
//! so events at the same time run in the order they were scheduled and a
//! replay is a function of its inputs alone.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Entry<E> {
    time_s: f64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    /// Reversed: `BinaryHeap` is a max-heap and the earliest must come first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .time_s
            .total_cmp(&self.time_s)
            .then(other.seq.cmp(&self.seq))
    }
}

/// A min-queue of events by (time, sequence).
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// Schedules `event` at `time_s` (a finite time; a NaN would sort last).
    pub fn push(&mut self, time_s: f64, event: E) {
        self.seq += 1;
        self.heap.push(Entry {
            time_s,
            seq: self.seq,
            event,
        });
    }

    /// The earliest event; among equal times, the first scheduled.
    pub fn pop(&mut self) -> Option<(f64, E)> {
        self.heap.pop().map(|e| (e.time_s, e.event))
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_and_ties_in_scheduling_order() {
        let mut q = EventQueue::default();
        q.push(5.0, "e");
        q.push(1.0, "a");
        q.push(3.0, "c");
        q.push(1.0, "b");
        q.push(3.0, "d");
        q.push(0.5, "first");
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(_, e)| e).collect();
        assert_eq!(order, ["first", "a", "b", "c", "d", "e"]);
        assert!(q.is_empty());
    }

    #[test]
    fn events_scheduled_while_running_interleave_by_time() {
        let mut q = EventQueue::default();
        q.push(10.0, 10);
        q.push(2.0, 2);
        let (t, e) = q.pop().unwrap();
        assert_eq!((t, e), (2.0, 2));
        // Scheduled later at an equal time: after the earlier-scheduled one.
        q.push(10.0, 11);
        q.push(4.0, 4);
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, [(4.0, 4), (10.0, 10), (10.0, 11)]);
    }
}
