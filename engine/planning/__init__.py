"""Planning: what a context length needs and where it goes — policy, model shape, plan, budgets, rates."""
