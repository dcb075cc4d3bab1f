"""ampe.energy"""
