"""Planning: what a run needs and where it goes — policy, model shape, plan, budgets, rates."""
