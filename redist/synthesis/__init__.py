"""Plan synthesis: the cheapest memory-bounded sequence of collectives from one sharding type to another.

Parts. :func:`synthesize` (:mod:`redist.synthesis.cases`) sends a pair to its case: two meshes (steps on each and
a ``transfer`` between them), two device orders, pending sums created, uneven dims, mesh axes of size 1, or even
types, which get one ``permute`` where that is the whole plan, else the searches' plan. A search runs over the
states of :mod:`redist.synthesis.space` (the array sharded over atoms of the mesh axes), by the moves of
:mod:`redist.synthesis.moves` (one per kind of collective, and a memory-efficient normal form), forward from the
source and backward from the destination, meeting at one ``permute`` (:mod:`redist.synthesis.search`). When the
searches give up, the plan is the fallback exchange of :mod:`redist.synthesis.fallback`, whose cost also prunes
them.

Choice. When source and destination have the same block count in every dim and the same partial axes, the
plan is one ``permute``, with no search: it receives exactly the lower bound, in one step. Otherwise the
search (:mod:`redist.synthesis.search`) minimises (bytes received, number of steps): a move is charged what
its step receives (the moves of a run together what their one step receives), and a run counts as one step.
Costs are exact integers in units of ``1 / mesh.size`` bytes (every ``k`` divides the mesh size). Sizes of
axes are arbitrary integers. When splitting the atoms into prime factors (Shardy's sub-axes) gives other
atoms, and the plan over the named atoms misses the lower bound or takes three steps or more (with sums to
reduce: misses the least that reducing costs the normal form's plans,
:func:`~redist.synthesis.fallback.reduction_bound`), or does not exist (an axis must be swapped for a part of
another of a different size), the search is run again over the prime atoms and the better plan is kept.

Reductions. The reduction kind of a pending value (sum, max, min, prod) is the same on both sides
(:func:`redist.bounds.check_pair`); every ``reduce_scatter`` and ``all_reduce`` of a plan takes the source's,
and the search is the same for every kind.

Budget and fallback. The searches of one ``synthesize`` call generate at most ``MAX_STATES`` (50,000;
the budget's constants are in :mod:`redist.synthesis.search`) states in all, counted in both directions,
fewer for ranks above 8 (a state is a tuple per dim), at most ``MAX_EXACT_STATES`` (15,000) where no pending
sum is reduced (the fallback's exchange then receives the lower bound, and a search can only tie with it),
and twice that with a topology: its own searches by modeled time get a second budget, and stop once every
plan left costs more, in their modeled time, than the faster of the fewest-bytes plan and the exchange by
:func:`redist.cost.plan_time` (of those of them that are cheap to price, :func:`redist.cost.cheap_to_price`:
an exchange in which every device receives from thousands of others runs thousands of rounds, and listing
them would take longer than the search); the candidates are then compared by :func:`redist.cost.fastest`,
which prices exactly only those whose lower bound may win. A search over sub-axes also stops after
``MAX_REFINED_EXPANSIONS`` expansions, except when the search over whole axes found no plan by bytes and the
pair reduces (the fallback then misses the bound). The budget counts states, not seconds, so that every MPI
rank, synthesizing on its own, gets the same plan. It bounds the CPU time and memory of a call's searches
(``bench/search_scale.py`` measures both on meshes of up to 65,536 devices, rank 8 on 16 axes, and counts the
states of the calls that find a plan of collectives, which stay well inside the budget). When no search
finds a plan within the budget, or none exists in normal form, ``synthesize`` still returns a plan, and
never raises for a valid pair: the pending sums that the destination does not keep are reduced
(reduce-scattered onto dims they divide, else all-reduced), then one ``exchange`` receives exactly what each
device lacks. It is memory-bounded like every plan and, without a reduction, at the lower bound in bytes, but
it is point-to-point traffic rather than collectives; with a reduction it can receive more than a searched
plan would.
"""

from redist.synthesis.cases import synthesize

__all__ = ["synthesize"]
