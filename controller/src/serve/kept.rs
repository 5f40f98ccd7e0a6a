//! [`KeptWorld`]: the world of `sluice serve`'s files, kept between reloads and changed by the
//! objects that changed.
//!
//! Why: building the world again from every file's objects on each reload (a map insert and
//! its key's strings per object) cost about 15 ms at 10,000 HTTPRoutes, a third of the budget
//! a route change has to reach traffic. A reload that changed one file now removes that file's
//! old objects and puts its new ones. When a name is held by more than one document (a later
//! file wins a duplicate name), which one wins depends on every file, so the world is then
//! built again whole, as before.

use std::collections::HashMap;

use sluice_config::World;
use sluice_config::world::{Key, Kind, Object};

/// The world of the files' objects and how many documents hold each name.
#[derive(Debug, Default)]
pub struct KeptWorld {
    /// `None`: to be built again from every file.
    world: Option<World>,
    holders: HashMap<(Kind, Key), u32>,
    /// The changes not applied yet: each changed file's objects before and after.
    pending: Vec<(Vec<Object>, Vec<Object>)>,
}

impl KeptWorld {
    /// Notes that a file's objects went from `old` to `new` (a new file: `old` empty; a file
    /// gone: `new` empty).
    pub fn replace(&mut self, old: &[Object], new: &[Object]) {
        for o in old {
            let name = (o.kind(), o.key());
            match self.holders.get_mut(&name) {
                Some(n) if *n > 1 => {
                    // Another document holds the name: it may win now.
                    self.world = None;
                    *n -= 1;
                }
                Some(_) => drop(self.holders.remove(&name)),
                None => {}
            }
        }
        for o in new {
            let n = self.holders.entry((o.kind(), o.key())).or_default();
            *n += 1;
            if *n > 1 {
                self.world = None;
            }
        }
        if self.world.is_some() {
            self.pending.push((old.to_vec(), new.to_vec()));
        } else {
            self.pending.clear();
        }
    }

    /// The world as the files are now: the kept one with the pending changes applied, or (the
    /// first time, or after a change to a name several documents hold) one built from `all`,
    /// every file's objects in file order.
    pub fn world<'a>(&mut self, all: impl Iterator<Item = &'a Object>) -> &World {
        match &mut self.world {
            Some(w) => {
                // Every removal first: an object that moved from one file to another in the
                // same reload must end up present, whichever file was read first.
                for (old, _) in &self.pending {
                    for o in old {
                        w.remove(o.kind(), &o.key());
                    }
                }
                for (_, new) in self.pending.drain(..) {
                    for o in new {
                        w.put(o);
                    }
                }
            }
            None => {
                self.pending.clear();
                let mut w = World::new();
                for o in all {
                    w.put(o.clone());
                }
                self.world = Some(w);
            }
        }
        self.world.get_or_insert_with(World::new)
    }
}
