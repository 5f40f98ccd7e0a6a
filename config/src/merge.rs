//! [`merge`]: one walk over two sequences sorted the same way, pairing what both hold and
//! telling apart what only one holds.
//!
//! Why one helper: comparing a configuration with the previous one (which objects changed,
//! which pools came and went, what a change did, for the memo, the data plane, the endpoints
//! index and the change timeline) is the same sorted walk each time; written once, its
//! boundary cases are tested once.

use std::cmp::Ordering;
use std::iter::Peekable;

/// One step of a [`merge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merged<A, B> {
    /// Only the first sequence holds it.
    Left(A),
    /// Only the second sequence holds it.
    Right(B),
    /// Both hold it (the comparison said equal).
    Both(A, B),
}

/// The walk returned by [`merge`].
#[allow(missing_debug_implementations)]
pub struct Merge<I: Iterator, J: Iterator, F> {
    left: Peekable<I>,
    right: Peekable<J>,
    cmp: F,
}

/// Walks `left` and `right`, both sorted by the order `cmp` compares them in, in one pass.
pub fn merge<I, J, F>(left: I, right: J, cmp: F) -> Merge<I::IntoIter, J::IntoIter, F>
where
    I: IntoIterator,
    J: IntoIterator,
    F: FnMut(&I::Item, &J::Item) -> Ordering,
{
    Merge {
        left: left.into_iter().peekable(),
        right: right.into_iter().peekable(),
        cmp,
    }
}

impl<I, J, F> Iterator for Merge<I, J, F>
where
    I: Iterator,
    J: Iterator,
    F: FnMut(&I::Item, &J::Item) -> Ordering,
{
    type Item = Merged<I::Item, J::Item>;

    fn next(&mut self) -> Option<Self::Item> {
        let order = match (self.left.peek(), self.right.peek()) {
            (Some(a), Some(b)) => (self.cmp)(a, b),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => return None,
        };
        Some(match order {
            Ordering::Less => Merged::Left(self.left.next()?),
            Ordering::Greater => Merged::Right(self.right.next()?),
            Ordering::Equal => Merged::Both(self.left.next()?, self.right.next()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_the_common_and_keeps_each_sides_own_in_order() {
        let got: Vec<Merged<i32, i32>> = merge([1, 3, 4, 9], [2, 3, 9, 10, 11], i32::cmp).collect();
        use Merged::{Both, Left, Right};
        assert_eq!(
            got,
            [
                Left(1),
                Right(2),
                Both(3, 3),
                Left(4),
                Both(9, 9),
                Right(10),
                Right(11)
            ]
        );
        assert_eq!(merge([0; 0], [1], i32::cmp).collect::<Vec<_>>(), [Right(1)]);
        assert_eq!(merge([1], [0; 0], i32::cmp).collect::<Vec<_>>(), [Left(1)]);
        assert!(merge([0; 0], [0; 0], i32::cmp).next().is_none());
    }
}
